printf 'x1\ny\nx2\n' > g.txt
grep -n x g.txt
grep -c x g.txt
