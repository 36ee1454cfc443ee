{ echo a; echo b >&2; echo c; } > all.txt 2>&1
cat all.txt
