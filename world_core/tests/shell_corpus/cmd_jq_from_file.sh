cat > data.json <<'EOF'
{"items": [{"id": 1, "tags": ["x"]}, {"id": 2, "tags": ["y", "z"]}]}
EOF
jq '.items[] | .id' data.json
jq -r '.items[].tags | join(",")' data.json
