touch a.txt b.txt c.log
echo *.txt
