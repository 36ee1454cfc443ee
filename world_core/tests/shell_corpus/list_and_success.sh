true && echo yes
