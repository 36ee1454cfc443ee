echo first > f.txt
echo second > f.txt
cat f.txt
