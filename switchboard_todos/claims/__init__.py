"""What a claim needs beside its statement: the low-water marks its scans start from
(`marks`), the queues a worker serves (`selection`), the long polls that hold nothing while
they wait (`long_polls`), and the one LISTEN connection that wakes them (`listen`)."""
