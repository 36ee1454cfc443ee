printf 'a\n' > 1.txt; printf 'b\n' > 2.txt
cat 1.txt 2.txt
