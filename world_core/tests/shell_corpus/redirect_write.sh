echo hello > out.txt
cat out.txt
