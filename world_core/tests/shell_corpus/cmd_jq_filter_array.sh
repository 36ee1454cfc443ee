echo '[{"a":1},{"a":5},{"a":3}]' | jq -c 'map(select(.a > 2))'
