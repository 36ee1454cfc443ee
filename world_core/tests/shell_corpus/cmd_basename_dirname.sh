basename /a/b/c.txt
basename /a/b/c.txt .txt
dirname /a/b/c.txt
