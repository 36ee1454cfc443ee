printf 'alpha\nbeta\ngamma\n' > g.txt
grep a g.txt
