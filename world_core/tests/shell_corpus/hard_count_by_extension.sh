mkdir -p c
touch c/a.py c/b.py c/c.txt c/d.md c/e.py
find c -type f | sed 's/.*\.//' | sort | uniq -c | sort -rn
