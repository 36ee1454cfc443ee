mkdir dir1
touch b.txt a.txt
ls
