echo '{"u":"bob","n":2}' | jq -r '"\(.u) has \(.n) items"'
