echo '{"name":"w","n":3}' | jq -r '.name'
