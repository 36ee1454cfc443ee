echo a > f1; printf 'a\na\n' > f2
grep -c a f1 f2
