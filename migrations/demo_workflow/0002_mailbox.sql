-- demo_workflow/0002_mailbox: the demo customers' inbox. An order's reserve step
-- creates a confirmation link for its "paid" signal and appends a
-- demo.mail.payment_link event in its own transaction; the demo_mailbox sink
-- delivers each such event here, once (its writes commit with the sink's
-- cursor), as the email the customer receives. The demo's customers pay by
-- confirming the link they find here, and GET /demo/mailbox (operator
-- listener) lists the mails with their links.
--
-- link_token is the link's secret, as an email holds it: this is the
-- customer's inbox, not Better Compute's store (compute_confirmations keeps
-- only its hash). Nothing logs it.
CREATE TABLE demo_workflow_mailbox (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer   text NOT NULL,
    -- One payment link per order: the reserve step commits once.
    order_id   bigint NOT NULL UNIQUE,
    amount     integer NOT NULL,
    link_token text NOT NULL,
    sent_at    timestamptz NOT NULL DEFAULT compute_now()
);
