touch one two three
count=$(ls | wc -l)
echo "files: $count"
