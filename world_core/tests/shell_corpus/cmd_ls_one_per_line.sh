touch a b
ls -1
