printf 'one\ntwo\n' > a
printf 'one\nTWO\n' > b
diff -u a b | tail -n +3
