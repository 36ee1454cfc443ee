echo x > a.txt; echo y > b.txt
cat a.txt b.txt > c.txt
cat c.txt
