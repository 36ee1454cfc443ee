echo one > a &
wait
cat a
