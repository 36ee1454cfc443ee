printf 'apple\nbanana\napricot\ncherry\n' | grep '^a' | wc -l
