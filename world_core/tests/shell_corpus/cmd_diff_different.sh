printf 'one\ntwo\nthree\n' > a
printf 'one\n2\nthree\n' > b
diff a b
echo "status $?"
