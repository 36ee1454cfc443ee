echo a > x; echo b > y
cmp -s x y || echo differ
diff -q x y > /dev/null || echo "diff says $?"
