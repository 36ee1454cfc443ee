printf 'x\ny\nz\n' > f.txt
cat -n f.txt
