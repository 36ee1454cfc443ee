printf 'a\nb\n' > x
printf 'c\n' > y
wc -l x y
