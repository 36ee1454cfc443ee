{ echo visible; echo hidden >&2; } 2> err.txt
echo "---"
cat err.txt
