printf '1\n2\n' > a.txt
printf '1\n2\n3\n' > b.txt
for f in *.txt; do echo "$f $(wc -l < "$f")"; done
