touch a b c
ls
