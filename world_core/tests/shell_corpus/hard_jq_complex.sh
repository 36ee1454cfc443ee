cat > p.json <<'EOF'
[{"name":"a","score":3,"tags":["x","y"]},{"name":"b","score":9,"tags":["y"]},{"name":"c","score":5,"tags":[]}]
EOF
jq -c 'sort_by(-.score) | map({name, n: (.tags | length)})' p.json
jq -r '.[] | select(.tags | index("y")) | .name' p.json
jq '[.[].score] | add / length' p.json
jq -c 'group_by(.tags | length) | map(map(.name))' p.json
