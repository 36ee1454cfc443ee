cat > todo.txt <<'EOF'
[ ] buy milk
[x] call bob
[ ] pay rent
EOF
grep -c '^\[ \]' todo.txt
sed -i 's/^\[ \] pay rent/[x] pay rent/' todo.txt
grep '^\[x\]' todo.txt
