jq -n -c --arg x hello '{greeting: $x}'
