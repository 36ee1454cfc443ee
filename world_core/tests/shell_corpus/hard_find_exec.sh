mkdir -p a/b
echo x > a/1.txt; echo y > a/b/2.txt
find a -name '*.txt' -exec cat {} \; | sort
