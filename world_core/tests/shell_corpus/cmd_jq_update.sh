echo '{"v":1}' | jq -c '.v += 1 | .new = "yes"'
