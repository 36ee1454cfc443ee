echo '{"b":2,"a":1}' | jq -c 'to_entries | map("\(.key)=\(.value)")'
echo '{"a":{"b":{"c":1}}}' | jq -c '[paths]'
