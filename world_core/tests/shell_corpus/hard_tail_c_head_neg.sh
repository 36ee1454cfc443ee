printf 'line1\nline2\nline3\n' | head -n -1
printf 'abcdef' | tail -c 3
echo
