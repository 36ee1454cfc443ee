name=world
cat <<EOF
hello $name
sum $((2+3))
EOF
