name=world
cat <<'EOF'
hello $name
$(echo no)
EOF
