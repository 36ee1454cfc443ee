printf 'a.b\naxb\n' | grep -F 'a.b'
