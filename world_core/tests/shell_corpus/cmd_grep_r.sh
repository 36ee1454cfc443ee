mkdir -p src/sub
echo 'TODO one' > src/a.txt
echo 'nothing' > src/b.txt
echo 'TODO two' > src/sub/c.txt
grep -r TODO src | sort
