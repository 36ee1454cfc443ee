mkdir -p src
touch src/a.py src/b.py src/c.txt
for f in src/*.py; do echo "$f"; done
