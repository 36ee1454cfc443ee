printf 'x\n' > f
grep -q y f
echo "grep $?"
grep -q x f
echo "grep $?"
