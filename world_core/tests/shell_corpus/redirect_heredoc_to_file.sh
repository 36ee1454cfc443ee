cat > notes.md <<EOF
# Title
- item
EOF
wc -l notes.md
cat notes.md
