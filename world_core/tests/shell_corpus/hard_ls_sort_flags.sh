touch a.c b.a c.b
ls -r
ls -X 2>/dev/null || ls
