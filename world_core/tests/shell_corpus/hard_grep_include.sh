mkdir -p s
echo 'x' > s/a.py; echo 'x' > s/b.txt
grep -rl --include='*.py' x s
