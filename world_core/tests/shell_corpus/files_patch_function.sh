cat > lib.py <<'EOF'
def add(a, b):
    return a - b
EOF
sed -i 's/return a - b/return a + b/' lib.py
cat lib.py
grep -n 'return' lib.py
