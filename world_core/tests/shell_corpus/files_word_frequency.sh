cat > text.txt <<'EOF'
the cat and the dog
the end
EOF
tr ' ' '\n' < text.txt | sort | uniq -c | sort -rn | head -n 2
