mkdir -p a/b/c
[ -d a/b/c ] && echo made
mkdir a 2>/dev/null || echo exists
