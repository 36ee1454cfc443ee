printf '1\n2\n3\n' > n.txt
echo $(( $(wc -l < n.txt) * 10 ))
