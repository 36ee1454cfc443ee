printf '{"a":1}\n{"a":2}\n' > l.jsonl
jq -s -c 'map(.a)' l.jsonl
