printf 'z\ny\nx\n' > in.txt
sort < in.txt
