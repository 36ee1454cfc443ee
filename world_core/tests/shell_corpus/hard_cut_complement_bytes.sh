echo 'abcdef' | cut -c1,3,5
echo 'a,b,c' | cut -d, -f1 --complement
