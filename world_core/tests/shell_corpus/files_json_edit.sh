echo '{"count": 1}' > state.json
jq '.count += 1' state.json > tmp.json && mv tmp.json state.json
cat state.json
