echo a >> new.txt
cat new.txt
