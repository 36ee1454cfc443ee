mkdir -p p/q
touch p/a.py p/q/b.py p/q/c.txt
find p -name '*.py' | sort
