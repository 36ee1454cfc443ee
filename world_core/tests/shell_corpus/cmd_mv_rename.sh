echo data > old.txt
mv old.txt new.txt
ls
cat new.txt
