jq -n -c '{a: 1, b: [range(3)]}'
