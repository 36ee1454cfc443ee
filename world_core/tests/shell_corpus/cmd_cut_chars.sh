echo 'abcdef' | cut -c2-4
