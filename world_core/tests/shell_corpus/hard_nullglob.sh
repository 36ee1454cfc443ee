shopt -s nullglob
for f in *.none; do echo "never $f"; done
echo done
